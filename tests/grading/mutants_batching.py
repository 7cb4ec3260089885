from grading_mutants import Submission, Replace, Source, Prepend, Delete  # noqa: F401

BATCHING = "05_batching"
"""Exercise 5 (solutions/05_batching/batching.ipynb): right padding, the padding + causal mask,
positions, and one batched forward pass. 15 points: test_pad_right 1, test_pad_right_errors 1,
test_pad_right_hidden 2, test_batch_mask 2, test_batch_mask_hidden 2, test_position_ids 1,
test_position_ids_hidden 1, test_batched_logits 2, test_batched_logits_hidden 3."""

PAD = frozenset({"test_pad_right", "test_pad_right_hidden"})
MASK = frozenset({"test_batch_mask", "test_batch_mask_hidden"})
POSITIONS = frozenset({"test_position_ids", "test_position_ids_hidden"})
LOGITS = frozenset({"test_batched_logits", "test_batched_logits_hidden"})

WRONG = [
    Submission(
        "left_padded", BATCHING,
        "pad_right pads on the left, as chapter 8 does: the tokens are wrong, and the batched "
        "logits read the padding (the mask and positions assume right padding)",
        score=7, failing=PAD | LOGITS,
        edits={"pad_right": Replace("tokens[s, :len(row)] = row",
                                    "tokens[s, n - len(row):] = row")}),
    Submission(
        "lengths_off_by_one", BATCHING,
        "pad_right returns the index of each prompt's last token (L - 1) as its length (and pads "
        "to max + 1): the tokens are right, but the mask then hides every prompt's last token and "
        "batched_logits picks the row before it",
        score=7, failing=PAD | LOGITS,
        edits={"pad_right": Replace(
            "lengths = torch.tensor([len(row) for row in rows])                 # (b,)\n"
            "    n = int(lengths.max())",
            "lengths = torch.tensor([len(row) - 1 for row in rows])             # last index\n"
            "    n = int(lengths.max()) + 1")}),
    Submission(
        "no_empty_check", BATCHING,
        "pad_right never checks for an empty prompt: it returns a row of padding with length 0 "
        "instead of raising ValueError",
        score=12, failing=frozenset({"test_pad_right_errors", "test_pad_right_hidden"}),
        edits={"pad_right": Replace(
            "    for s, row in enumerate(rows):\n"
            "        if len(row) == 0:\n"
            '            raise ValueError(f"prompt {s} is empty: every prompt needs at least one '
            'token")\n', "")}),
    Submission(
        "mask_causal_only", BATCHING,
        "batch_mask forgets the padding (the causal triangle for every sequence): padding rows see "
        "padding keys. With right padding no real token looks ahead at padding, so the batched "
        "logits stay right and only the mask's tests fail",
        score=11, failing=MASK,
        edits={"batch_mask": Replace("return causal & real.unsqueeze(1)",
                                     "return causal.expand(len(lengths), n, n)")}),
    Submission(
        "mask_no_causality", BATCHING,
        "batch_mask forgets causality (only the padding mask): every real token sees the later "
        "tokens of its prompt, so the batched logits are wrong too",
        score=6, failing=MASK | LOGITS,
        edits={"batch_mask": Replace("return causal & real.unsqueeze(1)",
                                     "return real.unsqueeze(1).expand(-1, n, -1)")}),
    Submission(
        "positions_count_padding", BATCHING,
        "position_ids numbers every slot, padding included (arange for every row): the real "
        "tokens' positions are right, so only the positions' tests fail",
        score=13, failing=POSITIONS,
        edits={"position_ids": Replace("return torch.where(real, columns, 0)",
                                       "return columns.expand(len(lengths), n)")}),
    Submission(
        "positions_left_aligned", BATCHING,
        "position_ids subtracts the padding in front, as for chapter 8's left padding: each right-"
        "padded prompt starts at a negative position clamped to 0, so its logits are wrong",
        score=8, failing=POSITIONS | LOGITS,
        edits={"position_ids": Replace(
            "return torch.where(real, columns, 0)",
            "return (columns - (n - lengths.unsqueeze(-1))).clamp(min=0)")}),
    Submission(
        "last_column", BATCHING,
        "batched_logits takes the last column for every sequence (right for left padding): with "
        "right padding that is a padding slot for every prompt but the longest",
        score=10, failing=LOGITS,
        edits={"batched_logits": Replace("return logits[torch.arange(b), lengths - 1]",
                                         "return logits[:, -1]")}),
    Submission(
        "one_at_a_time", BATCHING,
        "batched_logits runs forward_with on each prompt alone: the right logits, but b forward "
        "passes (b times the matrix products) instead of one over the batch",
        score=10, failing=LOGITS,
        edits={"batched_logits": Source('''
def batched_logits(model, prompts):
    rows = []
    for prompt in prompts:
        tokens, lengths = pad_right([prompt])
        n = tokens.shape[1]
        logits = forward_with(model, tokens, position_ids(lengths, n), batch_mask(lengths, n))
        rows.append(logits[0, -1])
    return torch.stack(rows)
''')}),
    Submission(
        "library_pad_batch", BATCHING,
        "pad_right calls llmcore.batching.pad_batch (left padding) and rotates each row: the "
        "library's padding is refused, in pad_right's tests and in batched_logits, which uses it",
        score=6, failing=PAD | LOGITS | {"test_pad_right_errors"},
        edits={"pad_right": Source('''
from llmcore.batching import pad_batch


def pad_right(prompts, pad_id=0):
    tokens, real = pad_batch(prompts, pad_id=pad_id)                  # left-padded
    lengths = real.sum(dim=1)
    n = tokens.shape[1]
    shift = (torch.arange(n) + (n - lengths).unsqueeze(-1)) % n       # rotate each row
    return tokens.gather(1, shift), lengths
''')}),
    Submission(
        "torch_pad_sequence", BATCHING,
        "pad_right pads with torch.nn.utils.rnn.pad_sequence, torch's own version of the exercise: "
        "refused (the empty-input checks still run first and pass)",
        score=7, failing=PAD | LOGITS,
        edits={"pad_right": Replace(
            "tokens = torch.full((len(rows), n), pad_id, dtype=torch.long)     # (b, n)\n"
            "    for s, row in enumerate(rows):\n"
            "        tokens[s, :len(row)] = row                                     # real tokens "
            "first",
            "tokens = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, "
            "padding_value=pad_id)")}),
]
