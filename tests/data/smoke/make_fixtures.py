"""Write baseline.json, DFLASH.json and DDTREE.json: responses in the shape SGLang 0.5.11 sends.

"grammar" holds the answers to the grammar phase (dflashctl/smoke/grammar.py): for the baseline,
valid outputs of the kind xgrammar gives a random-weight model with the synthetic tokenizer and
--constrained-json-disable-any-whitespace; for the speculative runs, SGLang 0.5.11's HTTP 400 to
a constrained request with DFLASH (its scheduler's own message), for text and token-id prompts.

Run from the repository root: python tests/data/smoke/make_fixtures.py
The format is what `dflashctl smoke --record DIR` writes, so a recording from a GPU run
(benchmarks/gpu/smoke.sh keeps one in $OUT/recorded) can replace these files as they are.
"""

import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "python"))
from dflashctl.smoke import grammar, loadgen  # noqa: E402  (the same requests smoke sends)

HERE = Path(__file__).resolve().parent
SETTINGS = {"requests": 4, "sequential_requests": 2, "max_new_tokens": 16, "input_len": 8, "seed": 0}
# tokens per verify step after the first (prefill) token; random weights accept almost nothing.
STEPS = {"baseline": [1], "DFLASH": [1, 1, 1, 2], "DDTREE": [1, 2, 1, 3]}


def server_info(run: str, avg: float | None) -> dict:
    spec = run if run != "baseline" else None
    info = {
        "version": "0.5.11", "model_path": "/tmp/dflash-smoke/models/target", "tp_size": 1,
        "speculative_algorithm": spec,
        "speculative_draft_model_path": "/tmp/dflash-smoke/models/draft" if spec else None,
        "speculative_num_draft_tokens": 16 if spec else None,
        "speculative_ddtree_budget": 32 if spec == "DDTREE" else None,
        "attention_backend": "triton", "speculative_draft_attention_backend": "triton" if spec else None,
        "cuda_graph_max_bs": 8, "cuda_graph_bs": list(range(1, 9)) if spec else [1, 2, 4, 8],
        "disable_cuda_graph": False, "disable_piecewise_cuda_graph": True, "mem_fraction_static": 0.25,
        "max_running_requests": 48 if spec else 4096, "skip_tokenizer_init": True, "load_format": "dummy",
    }
    state = {"last_gen_throughput": 1000.0, "memory_usage": {"weight": 2.1, "kvcache": 30.5, "graph": 0.4}}
    if avg is not None:
        state["avg_spec_accept_length"] = avg
    info["internal_states"] = [state]
    return info


def response(run: str, index: int, prompt: list[int]) -> dict:
    n_new = SETTINGS["max_new_tokens"]
    # The same greedy output in every run, as on the H200: speculative decoding is lossless.
    rng = random.Random(f"prompt {index}")
    ids = [rng.randrange(1, 151936) for _ in range(n_new)]
    chunk_tokens, n, verify = [1], 1, 0
    while n < n_new:
        n = min(n_new, n + STEPS[run][verify % len(STEPS[run])])
        verify += 1
        chunk_tokens.append(n)
    meta = {"id": f"{run.lower()}-{index:04x}", "finish_reason": {"type": "length", "length": n_new},
            "prompt_tokens": len(prompt), "weight_version": "default", "total_retractions": 0,
            "reasoning_tokens": 0, "completion_tokens": n_new, "cached_tokens": 0,
            "e2e_latency": 0.02 + 0.004 * n_new}
    if run != "baseline":
        accepted = n_new - 1 - verify  # the prefill token is no verify pass (256/255 = 1.004 on the H200)
        meta.update({"spec_accept_rate": accepted / (verify * 15), "spec_accept_length": n_new / verify,
                     "spec_accepted_drafts": accepted, "spec_proposed_drafts": verify * 15,
                     "spec_verify_ct": verify})
    request = loadgen.payload(prompt, n_new)
    return {"request": request, "chunk_tokens": chunk_tokens, "final": {"output_ids": ids, "meta_info": meta}}


MODEL = "/tmp/dflash-smoke/models/target"
VALID = {  # (kind, api) -> output
    ("regex", "generate"): "yes, 733 apples",
    ("ebnf", "generate"): "bonjour Paris!",
    ("json_schema", "generate"): '{"ok": false, "color": "green", "size": "L"}',
    ("structural_tag", "generate"): '<call>{"city":"Paris"}</call>',
    ("json_schema", "openai"): '{"ok": false, "color": "blue", "size": "L"}',
    ("tool_call", "openai"): '{"city": "Berlin"}',  # the arguments of get_weather
}
REFUSAL = "{run} speculative decoding does not support grammar-constrained decoding yet."  # scheduler.py


def generate_answer(i: int, text: str) -> dict:
    ids = [100 + (7 * i + 3 * j) % 2900 for j in range(len(text) // 2 + 1)]
    return {"text": text, "output_ids": ids,
            "meta_info": {"id": f"grammar-{i:04x}", "finish_reason": {"type": "stop", "matched": 0},
                          "prompt_tokens": 9, "weight_version": "default", "total_retractions": 0,
                          "completion_tokens": len(ids), "cached_tokens": 0, "e2e_latency": 0.05}}


def chat_answer(i: int, case: grammar.Case, output: str) -> dict:
    message = {"role": "assistant", "content": output, "reasoning_content": None, "tool_calls": None}
    finish = "stop"
    if case.kind == "tool_call":
        message["content"] = None
        message["tool_calls"] = [{"id": f"call_{i:08x}", "index": 0, "type": "function",
                                  "function": {"name": "get_weather", "arguments": output}}]
        finish = "tool_calls"
    n = len(output) // 2 + 1
    return {"id": f"chat-{i:04x}", "object": "chat.completion", "created": 1764460800, "model": MODEL,
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish,
                         "matched_stop": None if case.kind == "tool_call" else 0}],
            "usage": {"prompt_tokens": 12, "total_tokens": 12 + n, "completion_tokens": n,
                      "prompt_tokens_details": None, "reasoning_tokens": 0},
            "metadata": {"weight_version": "default"}}


def grammar_answers(run: str) -> list[dict]:
    """What the grammar phase records: request, status, response (grammar.check_server)."""
    out = []
    if run == "baseline":
        for i, case in enumerate(grammar.CASES):
            output = VALID[(case.kind, case.api)]
            if case.api == "generate":
                path, body, answer = "/generate", grammar.generate_body(case), generate_answer(i, output)
            else:
                path, body = "/v1/chat/completions", grammar.chat_body(case, MODEL)
                answer = chat_answer(i, case, output)
            out.append({"kind": case.kind, "api": case.api, "request": {"path": path, "body": body},
                        "status": 200, "response": answer, "error": None})
        return out
    for ids in (None, grammar.PROBE_IDS):  # a server with a tokenizer, and one without
        out.append({"kind": grammar.PROBE.kind, "api": "generate",
                    "request": {"path": "/generate", "body": grammar.generate_body(grammar.PROBE, ids)},
                    "status": 400, "response": {"error": {"message": REFUSAL.format(run=run)}}, "error": None})
    return out


def main() -> None:
    prompts = loadgen.token_prompts(SETTINGS["requests"], SETTINGS["input_len"], SETTINGS["seed"])
    for run in STEPS:
        gen = [response(run, i, p) for i, p in enumerate(prompts)]
        avg = None
        if run != "baseline":
            avg = round(sum(g["final"]["meta_info"]["completion_tokens"] for g in gen)
                        / sum(g["final"]["meta_info"]["spec_verify_ct"] for g in gen), 4)
        doc = {"settings": {**SETTINGS, "prompts": "token ids", "origin": "tests/data/smoke/make_fixtures.py"},
               "server_info": server_info(run, avg), "generate": gen, "grammar": grammar_answers(run)}
        (HERE / f"{run}.json").write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
