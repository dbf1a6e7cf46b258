"""Vision-language inputs: loading images from data records (images.py) and the model's processor (processor.py).

images.py needs only Pillow; processor.py imports transformers / torch lazily, inside its functions.
"""
