# Source me (bash or zsh):  source scripts/env.sh
# Puts the project's venv and configurable-http-proxy (installed by scripts/setup.sh) first on PATH.
# Changes nothing else in the calling shell (no `set -e`, no cd).

if [ -n "${BASH_SOURCE:-}" ]; then
    _lf_env_src="${BASH_SOURCE[0]}"
elif [ -n "${ZSH_VERSION:-}" ]; then
    eval '_lf_env_src="${(%):-%x}"'
else
    _lf_env_src="$0"
fi
LABFLEET_ROOT="$(cd "$(dirname "$_lf_env_src")/.." && pwd)"
export LABFLEET_ROOT

for _lf_dir in "$LABFLEET_ROOT/.labfleet-tools/node_modules/.bin" "$LABFLEET_ROOT/.venv/bin"; do
    # remove an earlier copy, then prepend: sourcing twice does not grow PATH
    PATH=":$PATH:"
    PATH="${PATH//:"$_lf_dir":/:}"
    PATH="${PATH#:}"
    PATH="${PATH%:}"
    PATH="$_lf_dir${PATH:+:$PATH}"
done
export PATH
hash -r 2>/dev/null || true
# the venv is active in the usual sense too (prompt tools and some libraries look at it)
VIRTUAL_ENV="$LABFLEET_ROOT/.venv"
export VIRTUAL_ENV

if [ ! -x "$LABFLEET_ROOT/.venv/bin/python" ] || [ ! -e "$LABFLEET_ROOT/.labfleet-tools/node_modules/.bin/configurable-http-proxy" ]; then
    echo "scripts/env.sh: not installed yet; run: bash $LABFLEET_ROOT/scripts/setup.sh [--test]" >&2
fi
unset _lf_env_src _lf_dir
