#!/usr/bin/env bash
# musubi-tuner caches latents and text-encoder outputs before training (encoders=cached)
set -e
python src/musubi_tuner/cache_latents.py --dataset_config /WORKDIR/results/hunyuan_video-rtx4090-small_cards_lora/export/musubi/hunyuan_video_fp8_swap/dataset.toml --vae path/to/hunyuan-video-t2v-720p/vae/pytorch_model.pt
python src/musubi_tuner/cache_text_encoder_outputs.py --dataset_config /WORKDIR/results/hunyuan_video-rtx4090-small_cards_lora/export/musubi/hunyuan_video_fp8_swap/dataset.toml --text_encoder1 path/to/text_encoder --text_encoder2 path/to/text_encoder_2 --batch_size 16
