# Read (never imported) by dflashctl.sglang_features, as it reads SGLang's own file.
SPECULATIVE_CHOICES = ["DFLASH", "DDTREE", "EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"]


def add_cli_args(parser):
    parser.add_argument("--speculative-algorithm", type=str, choices=SPECULATIVE_CHOICES)
