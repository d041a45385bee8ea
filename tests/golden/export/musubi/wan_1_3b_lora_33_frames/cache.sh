#!/usr/bin/env bash
# musubi-tuner caches latents and text-encoder outputs before training (encoders=cached)
set -e
python src/musubi_tuner/wan_cache_latents.py --dataset_config /WORKDIR/results/wan2_1_t2v_1_3b-rtx4090-quick/export/musubi/wan_1_3b_lora_33_frames/dataset.toml --vae path/to/wan_2.1_vae.safetensors
python src/musubi_tuner/wan_cache_text_encoder_outputs.py --dataset_config /WORKDIR/results/wan2_1_t2v_1_3b-rtx4090-quick/export/musubi/wan_1_3b_lora_33_frames/dataset.toml --t5 path/to/models_t5_umt5-xxl-enc-bf16.pth --batch_size 16
