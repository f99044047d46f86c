# The stack's set-up on a GPU machine, for a command of your own: from the repository root,
#     source benchmarks/gpu/setup.sh && python3 -m dflashctl doctor
# unpacks the payload of $PAYLOAD_DIR (default .gpu: payload.tar.xz, benchmarks/README.md says how it
# is made) into $SITE (default /tmp/site) once a machine, and puts $SITE and this tree's python/ on
# PYTHONPATH. Every GPU script does the same through common.sh's stack_setup.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" || return 1
stack_setup || return $?
case ":$PYTHONPATH:" in *":$REPO/python:"*) ;; *) export PYTHONPATH=$REPO/python:$PYTHONPATH ;; esac
