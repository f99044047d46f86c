"""The oracle pair's default smoke load as it ran on the H200 (8 prompts of 32 tokens, 4 of them
also sequential, 256 new tokens each) and the grammar server's answers recorded there."""

from smoke_runner import DATA

GRAMMAR = DATA / "h200-oracle" / "grammar.json"  # the grammar server's answers on the H200
LOAD = ["--requests", "8", "--sequential-requests", "4", "--max-new-tokens", "256", "--input-len", "32",
        "--seed", "0"]
N, SEQ, NEW = 8, 4, 256
