#!/usr/bin/env bash
# musubi-tuner LoRA training, as autofit measured it
set -e
# defaults to review: the documented values of kohya-ss/musubi-tuner for hunyuan_video (lora), which memory does not decide (README.txt gives their sources)
DEFAULTS=(
  --learning_rate 0.0002  # defaults to review
  --timestep_sampling shift  # defaults to review
  --discrete_flow_shift 7.0  # defaults to review
  --max_train_epochs 16  # defaults to review
  --save_every_n_epochs 1  # defaults to review
  --seed 42  # defaults to review
)
accelerate launch --num_cpu_threads_per_process 1 --num_processes 1 --mixed_precision bf16 src/musubi_tuner/hv_train_network.py \
  --dit path/to/hunyuan_video.safetensors \
  --dataset_config /WORKDIR/results/hunyuan_video-rtx4090-small_cards_lora/export/musubi/hunyuan_video_fp8_swap/dataset.toml \
  --mixed_precision bf16 \
  --network_module networks.lora \
  --fp8_base \
  --network_dim 16 \
  --network_alpha 16 \
  --gradient_checkpointing \
  --sdpa \
  --blocks_to_swap 18 \
  --optimizer_type AdamW8bit \
  --gradient_accumulation_steps 1 \
  --output_dir output \
  --output_name hunyuan_video-rtx4090-small_cards_lora \
  "${DEFAULTS[@]}"
