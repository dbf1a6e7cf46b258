"""Helpers of the multimodal tests: test images and transformers' own Qwen-VL processor as the oracle."""
import base64
import io
import struct
import zlib


def solid_image(color=(200, 30, 30), size=(56, 56)):
    from PIL import Image

    return Image.new("RGB", size, color)


def pattern_image(seed: int, size=(56, 56)):
    """A deterministic image with structure (not one colour), so two seeds give different patches."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, size=(size[1], size[0], 3), dtype=np.uint8), "RGB")


def png_bytes(img) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def png_header_only(width: int, height: int) -> bytes:
    """A PNG whose header claims width x height and whose pixel data is a few bytes: a decompression bomb's
    shape, to check the pixel bound is applied from the header, before decoding."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00" * 16)) + chunk(b"IEND", b"")


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def hf_processor(ckpt: str, family: str):
    """transformers' own Qwen2_5_VLProcessor / Qwen3VLProcessor over the checkpoint's tokenizer, image processor
    and chat template. The class is built without its video processor: transformers requires one of torchvision's
    classes for it, and torchvision cannot be installed here; the image path (placeholder expansion in
    replace_image_token, tokenization, pixel values) is transformers' code unchanged."""
    import transformers
    from transformers import AutoImageProcessor, AutoTokenizer

    base = {"qwen2_5_vl": transformers.Qwen2_5_VLProcessor, "qwen3_vl": transformers.Qwen3VLProcessor}[family]

    class ImageOnlyProcessor(base):
        @classmethod
        def get_attributes(cls):
            return ["image_processor", "tokenizer"]

        def __init__(self, image_processor=None, tokenizer=None, chat_template=None):
            self.video_processor = None
            base.__init__(self, image_processor, tokenizer, None, chat_template=chat_template)

    with open(f"{ckpt}/chat_template.jinja") as f:
        template = f.read()
    return ImageOnlyProcessor(image_processor=AutoImageProcessor.from_pretrained(ckpt),
                              tokenizer=AutoTokenizer.from_pretrained(ckpt), chat_template=template)


def start_cpu_engine(ckpt: str, log_dir: str):
    """A real CPU engine server (subprocess, 127.0.0.1) serving `ckpt`; call .stop() when done."""
    import socket

    from slime_like.args import make_args
    from slime_like.backends.engine_api.launcher import start_engine

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return start_engine(make_args(hf_checkpoint=ckpt, seed=0, sglang_server_args={}), kind="cpu", port=port,
                        log_dir=log_dir, env={"OMP_NUM_THREADS": "1"})


def greedy_reference(model, image_token_id: int, prompt_ids: list, train_inputs, n: int):
    """(ids, log-probs) of n greedy tokens by full forward passes of the transformers VLM (no KV cache, no
    padding; M-RoPE positions computed by the model from mm_token_type_ids): the engine's oracle."""
    import torch

    from slime_like.multimodal.processor import hf_model_inputs

    ids, lps = list(prompt_ids), []
    with torch.no_grad():
        for _ in range(n):
            logits = model(**hf_model_inputs(image_token_id, ids, train_inputs)).logits[0, -1].float()
            t = int(logits.argmax())
            lps.append(float(torch.log_softmax(logits, -1)[t]))
            ids.append(t)
    return ids[len(prompt_ids):], lps
