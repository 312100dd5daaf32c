"""A toy next-token task whose loss visibly falls within ~20 AdamW steps on CPU.

Sequences follow a fixed random Markov chain over `active` token ids in
which every token has only `branching` possible successors, so the achievable
loss is about ln(branching) (0.69 for 2) against ln(vocab) (6.24 for 512) at
initialisation: first the model learns which ids occur at all (ln 64 = 4.16),
then the bigram table through embed -> lm_head.  Everything comes from fixed seeds, so two runs see the same batches.
"""

import math

import torch


class ToyTask:
    def __init__(self, vocab_size, batch=8, seq_len=32, num_batches=8,
                 branching=2, active=64, seed=1234):
        if vocab_size < 2 or branching < 1 or batch < 1 or seq_len < 1 or num_batches < 1:
            raise ValueError("toy: sizes must be positive (vocab >= 2)")
        active = min(active, vocab_size)
        if active < 1:
            raise ValueError("toy: active must be positive")
        self.vocab_size = vocab_size
        self.batch, self.seq_len = batch, seq_len
        self.branching = branching
        gen = torch.Generator().manual_seed(seed)
        # The chain lives on `active` token ids spread over the vocab, so both
        # TP halves of the embedding and lm_head take part.
        self.alphabet = torch.randperm(vocab_size, generator=gen)[:active]
        self.successors = torch.full((vocab_size, branching), -1, dtype=torch.long)
        self.successors[self.alphabet] = self.alphabet[
            torch.randint(0, active, (active, branching), generator=gen)]
        seqs = self._walk(batch * num_batches, seq_len, gen)
        self.data = seqs.view(num_batches, batch, seq_len + 1)
        # The first training batch (what eval_tokens always was).
        self.eval_tokens = seqs[:batch, :seq_len].clone()
        # A held-out batch: the same chain, drawn after the training data
        # (so the training batches are unchanged), never trained on.
        held = self._walk(batch, seq_len, gen)
        self.heldout_tokens = held[:, :-1].contiguous()
        self.heldout_targets = held[:, 1:].contiguous()

    def _walk(self, n, seq_len, gen):
        """n sequences of seq_len + 1 ids following the chain."""
        seqs = torch.empty(n, seq_len + 1, dtype=torch.long)
        seqs[:, 0] = self.alphabet[torch.randint(0, len(self.alphabet), (n,), generator=gen)]
        for t in range(seq_len):
            pick = torch.randint(0, self.branching, (n,), generator=gen)
            seqs[:, t + 1] = self.successors[seqs[:, t], pick]
        return seqs

    def batch_at(self, step):
        """(tokens [B, T], targets [B, T]) for a step; cycles the fixed data."""
        b = self.data[step % self.data.shape[0]]
        return b[:, :-1].contiguous(), b[:, 1:].contiguous()

    def floor(self):
        """Best achievable mean loss: the chain's per-token entropy (upper bound
        when successors collide, which only makes the chain more predictable)."""
        return math.log(self.branching)
