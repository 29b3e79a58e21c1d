"""A real `suffixspec serve` for the HTTP tests: a tiny FIM-capable model directory (a byte-level BPE
tokenizer trained on fixed text, a tiny random Qwen2) and the server as a subprocess on a free
loopback port, its output in a log file that failures print."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent.parent
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
            "<|fim_pad|>"]
# differs from plain ChatML on purpose (the system line) so the tests can tell the model's template was used
TINY_TEMPLATE = ("{{ '<|im_start|>system\\ntiny<|im_end|>\\n' }}{% for m in messages %}{{ '<|im_start|>' + m['role'] + "
                 "'\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}"
                 "{{ '<|im_start|>assistant\\n' }}{% endif %}")


WORDS = ("value", "count", "index", "items", "result", "total", "name", "size", "left", "right", "node", "token",
         "tree", "round", "budget", "prompt", "output", "length", "state", "parent", "depth", "score", "return",
         "self", "None", "True", "False", "range", "len", "list", "dict", "int", "float", "str", "print")


def tokenizer_corpus() -> list[str]:
    """The tiny tokenizer's training text: Python-like code made from a fixed seed. Fixed on purpose:
    trained on the project's own sources, every edit of those files changed the vocabulary, and with it
    the random model's outputs (a request that ran 30 tokens ended early at 21)."""
    import random

    rnd = random.Random(20261202)
    docs = []
    for d in range(24):
        lines = []
        for f in range(12):
            a, b, c = rnd.sample(WORDS[:22], 3)
            lines += [f"def {a}_{b}{f}({a}, {b}=None):", f'    """The {a} of {b} and {c}."""',
                      f"    {c} = {rnd.choice(('len', 'int', 'float', 'list'))}({a})",
                      f"    for i in range({rnd.randint(1, 64)}):",
                      f"        {c} += {a}[i] * {rnd.randint(0, 9)} + {b}",
                      f"    if {c} > {rnd.randint(0, 100)} and {b} is not None:",
                      f"        return {c} - {b}", f"    return {c}", "", ""]
        lines.append(f"class C{d}:\n    def __init__(self, x, y):\n        self.x, self.y = x, y\n")
        docs.append("\n".join(lines))
    return docs


def make_tiny_model_dir(path: Path, fim: bool = True, positions: int = 512) -> Path:
    """A byte-level BPE tokenizer (Qwen-style FIM tokens when `fim`) and a tiny random Qwen2 model."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from support.tiny_models import tiny_model

    path.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = SPECIALS if fim else SPECIALS[:3]
    trainer = trainers.BpeTrainer(vocab_size=420, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(tokenizer_corpus(), trainer)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>",
                                                            "chat_template": TINY_TEMPLATE}))
    model = tiny_model("qwen2", vocab=tok.get_vocab_size(), sharpen=8.0, positions=positions)
    model.save_pretrained(str(path))
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """`suffixspec serve ARGS` on a free loopback port; its stderr goes to a file (printed on failure)."""

    def __init__(self, args, log_path: Path, env=None, ready_timeout=600.0, wait=True):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        full_env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **(env or {}))
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "suffixspec.cli", "serve", "--port", str(self.port), *args],
                                     stdout=self._log, stderr=subprocess.STDOUT, env=full_env, cwd=str(ROOT))
        self.ready_timeout = ready_timeout
        if wait:
            self.wait_ready()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float | None = None) -> None:
        timeout = self.ready_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"server not ready after {timeout} s:\n{self.log()}")

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode
