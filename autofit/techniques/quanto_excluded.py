"""The layers a quanto base keeps in 16 bits, per family: torch-free, for the knobs' trainer words
(ai-toolkit's `quantize_kwargs.exclude` writes them) as well as for quantization.py, which
quantizes the base around them.
"""

# The layers SimpleTuner keeps out of quanto's reach, per family (helpers/training/quantisation,
# `_quanto_model`, bghira/SimpleTuner bc8e6ab): fnmatch patterns over module names, as quanto's
# `exclude` reads them. For SD3 "*norm*" keeps every AdaLayerNorm's linear in 16 bits (a third of
# SD3.5 Large's weights); the families it lists no patterns for are quantized whole.
QUANTO_EXCLUDED = {
    "flux": ("*.norm", "*.norm1", "*.norm2", "*.norm2_context", "proj_out", "x_embedder",
             "norm_out", "context_embedder"),
    "sd3": ("*norm*", "*norm1_context*", "*norm_added_q*", "*norm_added_k*", "proj_out*",
            "*pos_embed*", "*patch_embedding*", "*ffn*", "*scale_shift_table*", "*norm_out*",
            "*context_embedder*", "*time_text_embed*", "*time_proj*", "*condition_embedder*"),
}  # fmt: skip
