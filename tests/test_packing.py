"""tfmlib.packing (chapter 10): sentences joined with EOS and cut into fixed-length LM blocks."""

import pytest
import torch
from torch.utils.data import DataLoader, default_collate

from tfmlib.data import EOS_ID, PAD_ID, tokenize
from tfmlib.packing import PackedBlocks, bundled_english_blocks, pack_sequences, packed_stream
from tfmlib.rnn import lm_loss
from tfmlib.synthetic import load_bundled


def test_stream_and_blocks_by_hand():
    seqs = [[5, 6, 7], [8], [9, 10]]
    assert packed_stream(seqs) == [5, 6, 7, EOS_ID, 8, EOS_ID, 9, 10, EOS_ID]
    rows = pack_sequences(seqs, 3)                     # rows of 4 tokens: 9 // 4 = 2, one dropped
    assert rows.dtype == torch.long and rows.shape == (2, 4), rows.shape
    assert rows.tolist() == [[5, 6, 7, EOS_ID], [8, EOS_ID, 9, 10]], rows.tolist()
    assert pack_sequences(seqs, 2).tolist() == [[5, 6, 7], [EOS_ID, 8, EOS_ID], [9, 10, EOS_ID]]
    assert pack_sequences(seqs, 3, eos_id=99)[0].tolist() == [5, 6, 7, 99], "eos_id must be used"
    assert pack_sequences([torch.tensor([5, 6]), torch.tensor([7])], 1).tolist() == [[5, 6], [EOS_ID, 7]]


def test_dataset_items_are_shifted_and_nothing_but_the_tail_is_lost():
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 12, (40,), generator=g)
    seqs = [torch.randint(4, 50, (int(n),), generator=g).tolist() for n in lengths]
    stream = packed_stream(seqs)
    data = PackedBlocks(seqs, 7)
    assert data.stream_tokens == len(stream)
    assert len(data) == len(stream) // 8 and data.dropped == len(stream) % 8, (len(data), data.dropped)
    for i in range(len(data)):
        x, y = data[i]
        assert x.shape == y.shape == (7,)
        assert x.tolist() == stream[8 * i: 8 * i + 7] and y.tolist() == stream[8 * i + 1: 8 * i + 8], i
    assert "dropped" in repr(data)


def test_batches_work_with_lm_loss_and_every_position_counts():
    seqs = [[4 + (i * 7 + j) % 20 for j in range(1 + i % 6)] for i in range(50)]
    data = PackedBlocks(seqs, 5)
    inputs, targets = next(iter(DataLoader(data, batch_size=4)))
    assert inputs.shape == targets.shape == (4, 5)
    assert torch.equal(default_collate([data[0], data[1]])[0], torch.stack([data[0][0], data[1][0]]))
    assert not (targets == PAD_ID).any(), "packed blocks have no padding"
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(30, 8), torch.nn.Linear(8, 30))
    loss, n = lm_loss(model, (inputs, targets))
    assert n == 4 * 5, f"every position must count, got {n}"
    logits = model(inputs)
    expected = torch.nn.functional.cross_entropy(logits.reshape(-1, 30), targets.reshape(-1))
    torch.testing.assert_close(loss, expected)


def test_errors():
    with pytest.raises(ValueError, match="seqs is empty"):
        pack_sequences([], 4)
    with pytest.raises(ValueError, match=r"seqs\[1\] is empty"):
        pack_sequences([[5], []], 1)
    with pytest.raises(ValueError, match="block_len must be"):
        pack_sequences([[5, 6]], 0)
    with pytest.raises(ValueError, match="needs 6 tokens per block"):
        pack_sequences([[5, 6], [7]], 5)
    with pytest.raises(ValueError, match="PAD id"):
        pack_sequences([[5, PAD_ID, 6]], 1)
    with pytest.raises(TypeError, match="^pack_sequences: seqs must be a sequence of id sequences"):
        pack_sequences("abc", 1)
    # each public function names itself in its errors
    with pytest.raises(ValueError, match="^packed_stream: seqs is empty"):
        packed_stream([])
    with pytest.raises(ValueError, match=r"^PackedBlocks|^pack_sequences: seqs\[0\] is empty"):
        PackedBlocks([[]], 2)


def test_bundled_english_blocks_pack_the_first_sentences_with_their_own_vocabulary():
    blocks, vocab = bundled_english_blocks(50, 16)
    english = [tokenize(en) for en, _ in load_bundled("train")[:50]]
    stream = packed_stream([vocab.encode(s) for s in english])
    assert blocks.stream_tokens == len(stream) and len(blocks) == len(stream) // 17
    inputs, targets = blocks[1]
    assert inputs.tolist() == stream[17:33] and targets.tolist() == stream[18:34]
    assert set(vocab.itos[4:]) == {w for s in english for w in s}, "the vocabulary is the 50 sentences' words"
    with pytest.raises(ValueError, match="sentences must be an int >= 1"):
        bundled_english_blocks(0, 16)
    with pytest.raises(ValueError, match="holds"):
        bundled_english_blocks(10**9, 16)
