#!/usr/bin/env bash
# Build the llama.cpp peer: the llama.cpp vendored in the llama-cpp-python sdist, built with
# cmake into a shared libllama, and a venv holding the sdist's pure-Python `llama_cpp`
# package (loaded through LLAMA_CPP_LIB_PATH, so pip never compiles it a second time).
# Usage: nice -n 19 bash benchmarks/peers/setup_llamacpp.sh   (once; ~16 min on 2 cores)
# Lands in $JAXSERVE_PEERS_DIR/llamacpp (default benchmarks/peers/.envs/llamacpp, git-ignored):
#   venv/             python with numpy (the driver's only dependency) and llama_cpp on its path
#   src/              the unpacked sdist (vendor/llama.cpp has convert_hf_to_gguf.py and gguf-py)
#   lib/              libllama.so, libggml*.so
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="${JAXSERVE_PEERS_DIR:-$here/.envs}/llamacpp"
version="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
python="${PYTHON:-python3.11}"
jobs="${JOBS:-2}"
mkdir -p "$root"
if [ ! -d "$root/src" ]; then
  tmp="$(mktemp -d)"
  "$python" -m pip download -q --no-deps --no-binary :all: -d "$tmp" "llama-cpp-python==$version"
  tar -xzf "$tmp"/llama_cpp_python-*.tar.gz -C "$tmp"
  mv "$tmp"/llama_cpp_python-"$version" "$root/src"
  rm -rf "$tmp"
fi
if [ ! -f "$root/lib/libllama.so" ]; then
  cmake -S "$root/src/vendor/llama.cpp" -B "$root/build" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=ON \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF
  cmake --build "$root/build" --target llama -j "$jobs"
  mkdir -p "$root/lib"
  find "$root/build" -name 'lib*.so*' -exec cp -P {} "$root/lib/" \;
fi
venv="$root/venv"
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
"$venv/bin/pip" install -q numpy typing-extensions diskcache jinja2
site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "$root/src" > "$site/llama_cpp_src.pth"
LLAMA_CPP_LIB_PATH="$root/lib" "$venv/bin/python" -c \
  "import llama_cpp; print('llama_cpp', llama_cpp.__version__, llama_cpp.llama_print_system_info().decode())"
