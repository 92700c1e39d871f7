"""LitServe serving an OpenAI-shaped /v1/embeddings WITHOUT batching (max_batch_size=1), for bench/microbatch.

Adapted from ../shared/servers/litserve_server.py: the same tiny pure-Python 'model' idea, in the
shape an embeddings caller sends. One forward pass costs CALL_S + TOKEN_S per input token (like
the sim pod's embeddings-serial profile), whatever the number of inputs: the GPU-like economics that
make merging pay. Vectors are deterministic per input text (shake_256), so batched and unbatched
answers can be compared. Run with LitServe's venv: `python litserve_embed.py` (PORT, CALL_S, TOKEN_S).
"""

import hashlib
import math
import os
import time

import litserve as ls

CALL_S = float(os.environ.get("CALL_S", "0.020"))
TOKEN_S = float(os.environ.get("TOKEN_S", "0.00002"))
DIM = 8


def vector(text: str) -> list[float]:
    digest = hashlib.shake_256(text.encode()).digest(DIM)
    raw = [b / 127.5 - 1.0 for b in digest]
    norm = math.sqrt(sum(x * x for x in raw)) or 1.0
    return [round(x / norm, 6) for x in raw]


class Embeddings(ls.LitAPI):
    def setup(self, device):
        pass

    def decode_request(self, request):
        value = request["input"]
        return (request.get("model", "litserve-embed"), [value] if isinstance(value, str) else list(value))

    def predict(self, x):
        model, texts = x
        tokens = sum(max(1, math.ceil(len(t) / 4)) for t in texts)
        time.sleep(CALL_S + TOKEN_S * tokens)  # one forward pass over every input
        return model, texts, tokens

    def encode_response(self, output):
        model, texts, tokens = output
        data = [{"object": "embedding", "index": i, "embedding": vector(t)} for i, t in enumerate(texts)]
        return {
            "object": "list",
            "data": data,
            "model": model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }


if __name__ == "__main__":
    api = Embeddings(max_batch_size=1, api_path="/v1/embeddings")
    server = ls.LitServer(api, accelerator="cpu", workers_per_device=1, track_requests=True)
    server.run(host="127.0.0.1", port=int(os.environ.get("PORT", "8601")), generate_client_file=False)
