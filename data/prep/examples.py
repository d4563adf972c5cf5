"""Fine-tuning examples (--format pairs and chat): what makes a JSON record one (example_problem), and its tokens
with the loss mask that counts only the answers (encode_example). Reads and writes nothing.
"""

from .errors import PrepareError
from .tokenizers import encode_text


CHAT_TOKENS = ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")


def example_problem(record, fmt):
    """What keeps record from being a fine-tuning example of fmt (pairs or chat), or None."""
    if not isinstance(record, dict):
        return f"a JSON object was expected, got {type(record).__name__}"
    if fmt == "pairs":
        for key in ("prompt", "completion"):
            if not isinstance(record.get(key), str):
                return f"--format pairs needs a string \"{key}\"; the keys here are {sorted(record)}"
        return None
    messages = record.get("messages")
    if not isinstance(messages, list) or not messages:
        return "--format chat needs \"messages\": a list of {\"role\", \"content\"}"
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            return f"message {i} needs a string \"role\" and a string \"content\""
    if not any(m["role"] == "assistant" for m in messages):
        return "no \"assistant\" message: nothing in this conversation would be learnt"
    return None


def chat_token_ids(tokenizer):
    specials = tokenizer.specials or {}
    if any(t not in specials for t in CHAT_TOKENS):
        raise PrepareError(f"--format chat needs the {', '.join(CHAT_TOKENS)} special tokens of the llama3 "
                           f"tokenizer; the {tokenizer.name} tokenizer has none")
    return [specials[t] for t in CHAT_TOKENS]


def encode_example(tokenizer, record, fmt):
    """(tokens, mask) of one example, starting with BOS; mask[i] is 1 where predicting token i counts for the loss.
    pairs: BOS prompt completion EOS, counted from the completion on (EOS too: the model learns to stop).
    chat: Llama 3's template, BOS then per message <|start_header_id|>role<|end_header_id|> "\n\n" content
    <|eot_id|>, the special tokens as special tokens; the assistant's contents and their <|eot_id|> counted."""
    bos = tokenizer.bos_id
    if fmt == "pairs":
        prompt, completion = encode_text(tokenizer, record["prompt"]), encode_text(tokenizer, record["completion"])
        tokens = [bos] + prompt + completion + [tokenizer.eos_id]
        return tokens, [0] * (1 + len(prompt)) + [1] * (len(completion) + 1)
    start, end, eot = chat_token_ids(tokenizer)
    tokens, mask = [bos], [0]
    for m in record["messages"]:
        head = [start] + encode_text(tokenizer, m["role"]) + [end] + encode_text(tokenizer, "\n\n")
        body = encode_text(tokenizer, m["content"]) + [eot]
        tokens += head + body
        mask += [0] * len(head) + [1 if m["role"] == "assistant" else 0] * len(body)
    return tokens, mask
