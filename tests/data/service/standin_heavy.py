"""What the stand-in SGLang's processes each import, as SGLang's import torch, transformers and
SGLang: a module with a cost, which appends this process's pid to STANDIN_IMPORT_LOG each time it
is imported, so a test counts the imports (tests/service/test_faststart.py)."""

import decimal  # noqa: F401 (a few modules' worth of work, as an import of a real library)
import email.mime.multipart  # noqa: F401
import http.client  # noqa: F401
import os

if os.environ.get("STANDIN_IMPORT_LOG"):
    with open(os.environ["STANDIN_IMPORT_LOG"], "a") as f:
        f.write(f"{os.getpid()}\n")
TABLE = [i * i for i in range(200_000)]
