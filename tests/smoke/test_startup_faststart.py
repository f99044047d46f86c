"""smoke's start-up split with the fast start: the hook's own stamped lines in SGLang's log (the
texts dflash_faststart.say writes) read into how each child started, and the start-up line."""

import datetime as dt

from dflashctl.smoke import startup

LAUNCHED = dt.datetime(2026, 12, 3, 15, 0, 48)
LOG = """[2026-12-03 15:00:40.000] [dflash faststart] template ready: 3 modules imported in 1.0 s (first a)
[2026-12-03 15:00:52.000] [dflash faststart] template: transformers:AutoProcessor left out: its import tried to initialise CUDA (torch._C._cuda_init); starting over without it
[2026-12-03 15:00:59.500] [dflash faststart] template ready: 168 modules imported in 9.8 s (first torch, transformers)
[2026-12-03 15:01:00.000] server_args=ServerArgs(model_path='x')
[2026-12-03 15:01:00.100] [dflash faststart] scheduler_0: forked from the template (pid 5)
[2026-12-03 15:01:00.200] [dflash faststart] detokenizer: spawned: LD_PRELOAD changed since the template started (read at exec only)
[2026-12-03 15:01:02.000] Init torch distributed begin.
"""


def test_the_children_and_the_template_are_read_from_this_start_only():
    r = startup.phases(LOG, LAUNCHED, 20.0)
    assert r["faststart"] == {"template_s": 9.8, "modules": 168, "unusable": None, "forked": ["scheduler_0"],
                              "left_out": {"transformers:AutoProcessor": "its import tried to initialise CUDA "
                                                                         "(torch._C._cuda_init)"},
                              "spawned": {"detokenizer": "LD_PRELOAD changed since the template started "
                                                         "(read at exec only)"}}
    assert r["seconds"]["scheduler_start"] == 2.0
    line = startup.lines({"runs": [{"name": "DFLASH", "startup": r}]})[0]
    assert line.endswith("(scheduler_0 forked from the template (its imports 9.8s, beside the server's); "
                         "detokenizer spawned: LD_PRELOAD changed since the template started (read at exec only))")


def test_off_has_no_note_and_an_unusable_template_says_why():
    plain = "\n".join(LOG.splitlines()[3:4] + LOG.splitlines()[6:])
    assert startup.phases(plain, LAUNCHED, 20.0)["faststart"] is None
    unusable = ("[2026-12-03 15:00:59.000] [dflash faststart] template not usable: a child forked from the "
                "template could not initialise CUDA (cuInit answered 3); SGLang spawns its children as before\n") + plain
    f = startup.phases(unusable, LAUNCHED, 20.0)["faststart"]
    assert f["template_s"] is None and f["unusable"].startswith("a child forked from the template could not")
    assert startup.faststart_text(f).startswith("fast start not used: a child forked from the template")
