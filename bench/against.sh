#!/usr/bin/env bash
# Run one benchmark on this tree and on an earlier commit, alternately, in the same run:
#
#     bash bench/against.sh REV ROUNDS bench/online_inprocess.py [ARGS...]
#     bash bench/against.sh HEAD~3 2 bench/gateway.py --seconds 3
#
# The earlier commit is checked out in a temporary worktree and run with the same venv
# (its src/ first on PYTHONPATH, so `import kairos` and any server the bench spawns load that
# commit). This machine is shared and noisy: compare the rounds side by side, not with a
# number from another day.
set -euo pipefail
cd "$(dirname "$0")/.."
rev=$1 rounds=$2 script=$3
shift 3
python=${PYTHON:-$PWD/.venv/bin/python}
base=$(mktemp -d)
trap 'git worktree remove --force "$base" >/dev/null 2>&1 || rm -rf "$base"' EXIT
git worktree add --detach --force "$base" "$rev" >/dev/null 2>&1
for round in $(seq "$rounds"); do
    for side in this "$rev"; do
        echo "=== round $round: $side ($script)"
        if [ "$side" = this ]; then
            (PYTHONPATH=$PWD/src "$python" "$script" "$@")
        else
            (cd "$base" && PYTHONPATH=$base/src "$python" "$script" "$@")
        fi
    done
done
