"""LoRA: adapters on a transformer (peft), the pure key maps of each format, files in ComfyUI,
diffusers and kohya formats, and full-weight exports.
"""
