#!/usr/bin/env bash
# Create bench/.venv-feast: Feast's Python feature server, kept out of the project's venv.
#
#     bash bench/feast_env.sh            # idempotent; PYTHON=python3.11 picks the interpreter
#
# bench/online_http.py runs Feast from this venv and skips the Feast rows when it is missing.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="$here/.venv-feast"
feast_version="0.67.0"

if [[ -x "$venv/bin/feast" ]] && "$venv/bin/python" -c "
import importlib.metadata as m, sys
sys.exit(m.version('feast') != '$feast_version')
" 2>/dev/null; then
    echo "feast $feast_version already in $venv"
    exit 0
fi

"${PYTHON:-python3.11}" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet "feast[redis]==$feast_version"
"$venv/bin/feast" version
