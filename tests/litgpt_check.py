"""Run by tests/litgpt_env.py in LitGPT's own environment (litgpt 0.5.13), once for a test module
(importing LitGPT takes most of the time):

    python litgpt_check.py FOLDER CONFIG NAME...

writes to FOLDER a tiny checkpoint of LitGPT's config CONFIG and prints the sizes of LitGPT's
named configs NAME... as JSON. A checkpoint is what `litgpt download` leaves (model_config.yaml, lit_model.pth, tokenizer.json,
tokenizer_config.json), for a model of LitGPT's config NAME shrunk to two small layers, with
random weights, a word-level tokenizer of its own and beside the folder data.json, forty
instruction records for LitGPT's JSON data module: nothing is downloaded.
"""

import dataclasses
import json
import sys
from pathlib import Path

import torch
import yaml
from litgpt.config import Config
from litgpt.model import GPT
from tokenizers import Tokenizer, models, pre_tokenizers

SIZES = (
    "n_layer", "n_embd", "intermediate_size", "n_head", "n_query_groups", "head_size",
    "padded_vocab_size", "attn_bias", "bias", "mlp_class_name", "norm_class_name",
    "parallel_residual", "n_expert", "hf_config",
)  # fmt: skip
WORDS = [f"w{i}" for i in range(200)]
SPECIAL = ["<s>", "</s>", "<unk>"]


def architectures(names: list[str]) -> dict:
    return {name: {k: getattr(Config.from_name(name), k) for k in SIZES} for name in names}


def checkpoint(name: str, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    vocabulary = {word: i for i, word in enumerate(SPECIAL + WORDS)}
    tokenizer = Tokenizer(models.WordLevel(vocabulary, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(folder / "tokenizer.json"))
    special = {
        "bos_token": "<s>",
        "eos_token": "</s>",
        "add_bos_token": True,
        "tokenizer_class": "PreTrainedTokenizerFast",  # LitGPT reads it
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(special))
    tiny = dict(n_layer=2, n_embd=64, n_head=4, n_query_groups=2, head_size=16)
    config = Config.from_name(
        name, **tiny, intermediate_size=128, vocab_size=256, padded_vocab_size=256, block_size=512
    )
    (folder / "model_config.yaml").write_text(yaml.safe_dump(dataclasses.asdict(config)))
    torch.manual_seed(0)
    torch.save(GPT(config).state_dict(), folder / "lit_model.pth")
    records = [
        {
            "instruction": " ".join(WORDS[(7 * i + j) % len(WORDS)] for j in range(12)),
            "input": "",
            "output": " ".join(WORDS[(3 * i + j) % len(WORDS)] for j in range(20)),
        }
        for i in range(40)
    ]
    (folder.parent / "data.json").write_text(json.dumps(records))


if __name__ == "__main__":
    checkpoint(sys.argv[2], Path(sys.argv[1]))
    print(json.dumps(architectures(sys.argv[3:])))
