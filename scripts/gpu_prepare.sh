#!/usr/bin/env bash
# Prepare .gpu/ (git-ignored), the kit that travels to a GPU machine with no network (the device tool's
# `carry`): wheels of what AgentJet needs beyond that machine's image (Python 3.12, torch with CUDA), the same
# transformers as here, and SmolLM2's tokenizer files (the benchmarks build random-weight models with its shapes).
# Run here, with the .venv made by scripts/setup.sh. Then: scripts/gpu_check.sh on the GPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .gpu && mkdir -p .gpu/wheels .gpu/smollm2-tokenizer
# Versions as in this .venv; the image already holds torch, numpy, tokenizers, safetensors, huggingface-hub,
# httpx, anyio, h11, idna, typer, rich, pyyaml, jinja2, peft, accelerate, typing-extensions, regex, tqdm.
pkgs=(transformers pydantic pydantic_core annotated-types typing-inspection fastapi starlette uvicorn httptools
      openai jiter distro sniffio tenacity opentelemetry-api httpx2 httpcore2 truststore annotated-doc)
pins=()
for p in "${pkgs[@]}"; do
  pins+=("$p==$(.venv/bin/python -c "import importlib.metadata as m; print(m.version('$p'))")")
done
.venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux_2_27_x86_64 --platform any -d .gpu/wheels "${pins[@]}"
.venv/bin/python - <<'PY'
from transformers import AutoTokenizer
from agentjet.models import resolve_model
AutoTokenizer.from_pretrained(resolve_model("smollm2-135m-instruct")).save_pretrained(".gpu/smollm2-tokenizer")
PY
du -sh .gpu
