"""ComfyUI hosted in this process (headless workflows) and its workflow file formats. The only place of
the trainer that imports ComfyUI, and only inside functions.
"""
