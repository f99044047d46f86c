"""Unit values meant to break a unit file (quotes, specifiers, $, newlines, control bytes, paths
that look inside or outside the allowed roots): what both unit_text implementations are fed."""

HOSTILE = [
    "plain", "/opt/dflash/bin/dflashctl", "/srv/hf cache/%h", "50%", "a\\b", "a\\nb", 'say "hi"',
    "it's", "$HOME and ${X}", "$$", ";", "\\;", "", " lead", "tab\there",
    "line\nExecStartPre=+/bin/sh -c 'id'", "cr\rlf", "bell\x07", "del\x7f", "esc\x1b[0m",
    "/srv/modèles", "/var/cache/hf", "/var/cache/hf/", "/var/cache/hf cache", "/var/cache/a/b-c.d",
    "/var/cache/%h", "/var/cache/.hidden", "/var/cache/", "/var/lib/models/qwen", "/var/lib/x:y",
    "/home/me/hf", "/home", "/homework/hf", "/root/hf", "/run/user/1000/hf", "/run/hf", "/tmp/hf",
    "/var/tmp", "/var/tmpx/hf", "relative/hf", "/srv/../etc", "/srv/./hf", "/srv//hf", "/srv/hf",
    "/opt/my dflash/bin/dflashctl", "/opt/my'dflash", "/opt/$x/dflashctl", '/opt/"q"', "/opt/a\\b",
]
