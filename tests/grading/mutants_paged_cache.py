from grading_mutants import Submission, Replace, Source, Prepend, Delete  # noqa: F401

PAGED = "06_paged_cache"
"""Exercise 6 (solutions/06_paged_cache/paged_cache.ipynb): a block allocator, appending across
block boundaries, gathering by the block table, freeing, and paged attention. 22 points:
test_allocator 2, test_allocator_errors 1, test_allocator_hidden 2, test_append 2,
test_append_hidden 3, test_gather 2, test_gather_hidden 2, test_free_sequence 1,
test_free_sequence_hidden 2, test_paged_attention 2, test_paged_attention_hidden 3."""

ALLOCATOR = frozenset({"test_allocator", "test_allocator_errors", "test_allocator_hidden"})
APPEND = frozenset({"test_append", "test_append_hidden"})
GATHER = frozenset({"test_gather", "test_gather_hidden"})
FREE = frozenset({"test_free_sequence", "test_free_sequence_hidden"})
ATTENTION = frozenset({"test_paged_attention", "test_paged_attention_hidden"})

WRONG = [
    Submission(
        "hands_out_used_block", PAGED,
        "allocate hands out the id num_blocks - num_free (the count of blocks in use), right "
        "while nothing has been freed; after a free in the middle it hands out a block still in "
        "use, so a new sequence overwrites another's keys",
        score=15, failing=frozenset({"test_allocator", "test_allocator_hidden"}) | FREE,
        edits={"allocator": Replace(
            "block = min(self.free_blocks)\n        self.free_blocks.remove(block)",
            "block = self.num_blocks - len(self.free_blocks)       # the next unused id\n"
            "        self.free_blocks.discard(block)")}),
    Submission(
        "double_free_unchecked", PAGED,
        "free puts any id in the pool back without asking whether it is already free: a double "
        "free passes silently",
        score=19, failing=frozenset({"test_allocator_errors", "test_allocator_hidden"}),
        edits={"allocator": Replace(
            "        if block in self.free_blocks:\n"
            "            raise ValueError(f\"double free: block {block} is already free\")\n", "")}),
    Submission(
        "new_block_early", PAGED,
        "append takes a new block one token early (when the last slot is about to be filled, "
        "t + 1 == blocks * p): the keys land in the right slots, but every table holds an empty "
        "block too soon and the pool runs out early",
        score=14, failing=APPEND | FREE,
        edits={"paged_store": Replace("if t == len(table) * self.block_size:",
                                      "if t + 1 >= len(table) * self.block_size:")}),
    Submission(
        "slot_is_length", PAGED,
        "append writes token t at slot t instead of t % p: past the first block the slot is out "
        "of range (IndexError), so everything built on append fails too",
        score=12, failing=APPEND | FREE | {"test_paged_attention"},
        edits={"paged_store": Replace(", t % self.block_size", ", t")}),
    Submission(
        "pool_order", PAGED,
        "gather reads the sequence's blocks in pool order (sorted ids) instead of table order: "
        "right while tables happen to increase, wrong once blocks are reused",
        score=15, failing=GATHER | {"test_paged_attention_hidden"},
        edits={"gather": Replace("torch.tensor(store.block_table(seq_id), dtype=torch.long)",
                                 "torch.tensor(sorted(store.block_table(seq_id)), "
                                 "dtype=torch.long)")}),
    Submission(
        "contiguous_blocks", PAGED,
        "gather assumes a sequence's blocks sit side by side in the pool, from its first block "
        "on: wrong as soon as two sequences interleave",
        score=13, failing=GATHER | ATTENTION,
        edits={"gather": Source('''
def gather(store, seq_id):
    table, m = store.block_table(seq_id), store.length(seq_id)
    first, d_head = (table[0] if table else 0), store.keys.shape[-1]
    keys = store.keys[first:first + len(table)].reshape(-1, d_head)[:m]
    values = store.values[first:first + len(table)].reshape(-1, d_head)[:m]
    return keys, values
''')}),
    Submission(
        "token_loop", PAGED,
        "gather picks every token's row from its block and slot in a Python loop and stacks "
        "them: the right numbers, but one read per token instead of one gather by the table",
        score=18, failing=GATHER,
        edits={"gather": Source('''
def gather(store, seq_id):
    table, p = store.block_table(seq_id), store.block_size
    where = [(table[t // p], t % p) for t in range(store.length(seq_id))]
    keys = torch.stack([store.keys[block, slot] for block, slot in where])
    values = torch.stack([store.values[block, slot] for block, slot in where])
    return keys, values
''')}),
    Submission(
        "forgets_blocks", PAGED,
        "free_sequence forgets the sequence but never gives its blocks back: they leak, and new "
        "sequences take fresh blocks until the pool runs out",
        score=19, failing=FREE,
        edits={"free_sequence": Replace("for block in store.tables.pop(seq_id):\n"
                                        "        store.allocator.free(block)",
                                        "store.tables.pop(seq_id)")}),
    Submission(
        "no_scaling", PAGED,
        "paged_attention forgets to divide the scores by sqrt(d_head)",
        score=17, failing=ATTENTION,
        edits={"paged_attention": Replace(" / math.sqrt(q.shape[-1])", "")}),
    Submission(
        "library_allocator", PAGED,
        "BlockAllocator subclasses llmcore.paged's allocator (sorting its free list so that the "
        "smallest id comes first): the right ids and errors, but the library does the work, and "
        "every test that allocates refuses it",
        score=9, failing=ALLOCATOR | APPEND | FREE,
        edits={"allocator": Source('''
from collections import deque

import llmcore.paged


class BlockAllocator(llmcore.paged.BlockAllocator):
    """llmcore's allocator, smallest free id first."""

    def allocate(self):
        if not self.free_list:
            raise RuntimeError(f"no free block: all {self.num_blocks} blocks are in use")
        self.free_list = deque(sorted(self.free_list))
        return super().allocate()
''')}),
]
