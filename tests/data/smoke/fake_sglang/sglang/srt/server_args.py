"""Stand-in for SGLang's sglang/srt/server_args.py: 0.5.11's parser, with the DDTree patch.

dflashctl's sglang probe reads this file with `ast` (never imports it), as it reads SGLang's own:
the literal list below is what it finds for --speculative-algorithm. The stand-in's launch_server
parses its argv with every argument SGLang 0.5.11 defines, read off the locked wheel
(tests/data/sglang/strict_args.py and server-args-0.5.11.json), and these choices: 0.5.11's plus
DDTREE, as on a host with the DDTree patch, which also adds --speculative-ddtree-budget. Without
DDTREE in the list (tests remove it) the parser is 0.5.11's exactly.
"""

import sys

SPECULATIVE_CHOICES = ["DFLASH", "DDTREE", "EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"]


def add_cli_args(parser):
    parser.add_argument("--speculative-algorithm", type=str, choices=SPECULATIVE_CHOICES)


def strict_args():
    try:
        import strict_args as facts  # tests/data/sglang, on the tests' PYTHONPATH
    except ImportError:
        sys.exit("stand-in SGLang: tests/data/sglang (strict_args.py) is not on PYTHONPATH")
    return facts


def prepare_server_args(argv):
    """The namespace SGLang's parser gives for argv; exit 2 (argparse) for what it refuses."""
    return strict_args().parse(argv, ddtree="DDTREE" in SPECULATIVE_CHOICES)
