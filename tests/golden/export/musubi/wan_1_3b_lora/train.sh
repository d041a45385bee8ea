#!/usr/bin/env bash
# musubi-tuner LoRA training, as autofit measured it
set -e
# defaults to review: the documented values of kohya-ss/musubi-tuner for wan (lora), which memory does not decide (README.txt gives their sources)
DEFAULTS=(
  --learning_rate 0.0002  # defaults to review
  --timestep_sampling shift  # defaults to review
  --discrete_flow_shift 3.0  # defaults to review
  --max_train_epochs 16  # defaults to review
  --save_every_n_epochs 1  # defaults to review
  --seed 42  # defaults to review
)
accelerate launch --num_cpu_threads_per_process 1 --num_processes 1 --mixed_precision bf16 src/musubi_tuner/wan_train_network.py \
  --task t2v-1.3B \
  --dit path/to/wan2_1_t2v_1_3b.safetensors \
  --dataset_config /WORKDIR/results/wan2_1_t2v_1_3b-rtx4090-quick/export/musubi/wan_1_3b_lora/dataset.toml \
  --mixed_precision bf16 \
  --network_module networks.lora_wan \
  --network_dim 16 \
  --network_alpha 16 \
  --gradient_checkpointing \
  --sdpa \
  --optimizer_type AdamW \
  --optimizer_args fused=True \
  --gradient_accumulation_steps 1 \
  --output_dir output \
  --output_name wan2_1_t2v_1_3b-rtx4090-quick \
  "${DEFAULTS[@]}"
