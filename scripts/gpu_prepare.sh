#!/usr/bin/env bash
# Prepare .gpu/ (git-ignored), the kit that travels with the working tree to a GPU machine with no network:
# wheels (CPython 3.12, manylinux x86-64) of what AgentJet and its CUDA tests need beyond that machine's image
# (an image with Python 3.12, CUDA torch, transformers, numpy, httpx, typer, rich, peft, pytest...), the same
# transformers as here, SmolLM2's tokenizer files (the benchmarks build random-weight models with its shapes) and
# the commit. Run here, with the .venv made by scripts/setup.sh; then scripts/gpu_check.sh on the GPU machine.
#
#   scripts/gpu_prepare.sh                     # .gpu/ (about 25 MB)
#   scripts/gpu_prepare.sh --rehearse DIR      # also the same versions for this machine's Python in DIR, for
#                                              # `REHEARSE=1 WHEELS=DIR scripts/gpu_check.sh` on the CPU
set -euo pipefail
cd "$(dirname "$0")/.."
rehearse=""
[ "${1:-}" = "--rehearse" ] && rehearse=${2:?--rehearse needs a folder}
rm -rf .gpu && mkdir -p .gpu/wheels .gpu/smollm2-tokenizer
# Versions as in this .venv. What the image already holds is not carried (torch, numpy, tokenizers, safetensors,
# huggingface-hub, httpx, anyio, h11, idna, click, typer, rich, pyyaml, jinja2, peft, accelerate, uvloop,
# prometheus-client, typing-extensions, regex, tqdm, pluggy, iniconfig, hypothesis, pytest-xdist); pytest and its
# plugins are, since pytest-asyncio needs a newer pytest than some images have; py-spy profiles the server process;
# msgpack is the engine process's wire.
pkgs=(transformers pydantic pydantic_core annotated-types typing-inspection fastapi starlette uvicorn httptools
      openai jiter distro sniffio tenacity opentelemetry-api httpx2 httpcore2 truststore annotated-doc
      pytest pytest-asyncio pytest-timeout py-spy msgpack)
pins=()
for p in "${pkgs[@]}"; do
  pins+=("$p==$(.venv/bin/python -c "import importlib.metadata as m; print(m.version('$p'))")")
done
download() {  # download DIR PYTHON_VERSION
  .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version "$2" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux_2_27_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 --platform any \
    -d "$1" "${pins[@]}"
}
download .gpu/wheels 3.12
if [ -n "$rehearse" ]; then
  rm -rf "$rehearse" && mkdir -p "$rehearse"
  download "$rehearse" "$(.venv/bin/python -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
fi
.venv/bin/python - <<'PY'
from transformers import AutoTokenizer
from agentjet.models import resolve_model
AutoTokenizer.from_pretrained(resolve_model("smollm2-135m-instruct")).save_pretrained(".gpu/smollm2-tokenizer")
PY
git rev-parse HEAD >.gpu/commit
du -sh .gpu
