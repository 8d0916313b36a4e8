#!/usr/bin/env bash
# From GRU to Transformer: one entry point for readers and CI.
#
#   bash run.sh setup          create .venv and install tfmlib with the book's tools (idempotent)
#   bash run.sh book [PROFILE] set up, execute copies of every notebook, write build/html/index.html
#   bash run.sh test [ARGS]    set up, run the unit tests and every notebook (smoke profile)
#   bash run.sh lab            set up, open JupyterLab on notebooks/
#
# PROFILE is smoke, cpu or gpu (default: $TFM_PROFILE, else gpu when CUDA is available, else cpu).
# TFM_TORCH names the torch to install when .venv has none (default: torch==2.13.0, the CPU build on a
# Linux x86-64 machine without an NVIDIA GPU).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")"

VENV=.venv
PY="$VENV/bin/python"
STAMP="$VENV/.tfm-installed"

usage() {
    sed -n '2,11s/^# \{0,1\}//p' "$0"
}

stamp_value() {
    # The installed state is current while pyproject.toml and the torch request are unchanged.
    { cat pyproject.toml; echo "torch=${TFM_TORCH:-}"; } | "$PY" -c \
        'import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())'
}

TORCH_PIN="torch==2.13.0"

default_torch() {
    # On Linux x86-64 pip's default torch is a CUDA build with several GB of NVIDIA libraries;
    # a machine without an NVIDIA GPU gets the CPU build (a few hundred MB) instead.
    if [ "$(uname -s)" = Linux ] && [ "$(uname -m)" = x86_64 ] \
        && ! command -v nvidia-smi >/dev/null 2>&1 && [ ! -e /proc/driver/nvidia/version ]; then
        echo "$TORCH_PIN --index-url https://download.pytorch.org/whl/cpu"
    else
        echo "$TORCH_PIN"
    fi
}

setup() {
    if [ ! -x "$PY" ]; then
        if ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
            echo "run.sh: the book needs Python 3.10 or newer as python3; found $(python3 --version 2>&1)" >&2
            exit 1
        fi
        echo "run.sh: creating $VENV with $(python3 --version 2>&1)"
        python3 -m venv "$VENV"
    fi
    if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$(stamp_value)" ] \
        && "$PY" -c 'import importlib.util as u, sys; sys.exit(not (u.find_spec("torch") and u.find_spec("tfmlib")))' \
            >/dev/null 2>&1; then
        return 0
    fi
    if ! "$PY" -c 'import torch' >/dev/null 2>&1; then
        # A pinned torch keeps pip from pulling whatever is newest; TFM_TORCH picks the build.
        local want="${TFM_TORCH:-$(default_torch)}"
        echo "run.sh: installing $want"
        # shellcheck disable=SC2086  # the request may carry pip options on purpose
        if ! "$PY" -m pip install -q --retries 1 $want && [ -z "${TFM_TORCH:-}" ] && [ "$want" != "$TORCH_PIN" ]; then
            echo "run.sh: that failed; installing pip's default build, $TORCH_PIN"
            "$PY" -m pip install -q "$TORCH_PIN"
        fi
    fi
    echo "run.sh: installing tfmlib and the book's tools into $VENV"
    "$PY" -m pip install -q -e ".[book]"
    stamp_value > "$STAMP"
}

cmd="${1:-help}"
[ $# -gt 0 ] && shift

case "$cmd" in
    setup)
        setup
        echo "run.sh: $VENV is ready ($("$PY" -c 'import torch; print("torch", torch.__version__)'))"
        ;;
    book)
        setup
        if [ $# -gt 0 ]; then
            case "$1" in
                smoke|cpu|gpu) export TFM_PROFILE="$1"; shift ;;
                -*) ;;  # options for tools/book.py build
                *) echo "run.sh: unknown profile '$1' (choose smoke, cpu or gpu)" >&2; exit 2 ;;
            esac
        fi
        status=0
        "$PY" tools/book.py build "$@" || status=$?
        if [ $# -eq 0 ] && [ -f build/html/index.html ]; then
            echo "run.sh: open $(pwd)/build/html/index.html"
        fi
        exit "$status"
        ;;
    test)
        setup
        exec "$PY" -m pytest "$@"
        ;;
    lab)
        setup
        # Jupyter refuses to start as root (Docker, many cloud notebooks) unless told it may.
        as_root=()
        [ "$(id -u)" = 0 ] && as_root=(--allow-root)
        exec "$VENV/bin/jupyter" lab ${as_root[@]+"${as_root[@]}"} notebooks/
        ;;
    help|-h|--help)
        usage
        ;;
    *)
        echo "run.sh: unknown command '$cmd'" >&2
        usage >&2
        exit 2
        ;;
esac
