#!/usr/bin/env bash
# ctest fixture of the server tests: a virtual environment of its own (under the build directory,
# git-ignored) with the `openai` client from PyPI, so the tests talk to `deepfuse serve` as real
# users' code does. Reused when it already has the client.
set -euo pipefail
venv=${1:?usage: setup_venv.sh VENV_DIR}
if [[ -x $venv/bin/python ]] && "$venv/bin/python" -c "import openai" 2>/dev/null; then
  echo "setup_venv: $venv has openai $("$venv/bin/python" -c 'import openai; print(openai.__version__)')"
  exit 0
fi
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "openai>=1.30"
echo "setup_venv: installed openai $("$venv/bin/python" -c 'import openai; print(openai.__version__)') into $venv"
