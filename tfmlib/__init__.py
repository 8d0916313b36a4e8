"""tfmlib: the companion package of the book *From GRU to Transformer*.

Every module holds what one chapter builds, and is introduced by that chapter; a notebook imports
only modules introduced by its own or earlier chapters (``tests/test_book.py`` checks this). The
chapter of each module is the constant ``INTRODUCED_IN`` at its top.

=====================  =======  ==============================================================
module                 chapter  what it holds
=====================  =======  ==============================================================
``config``             00       profiles (smoke / cpu / gpu), device choice, seeding
``data``               00       tokenizer, vocabulary, padding and masks, bucket-by-length batches
``synthetic``          00       the generator of the bundled English->French corpus
``corpora``            00       loaders for real corpora (Tatoeba/Anki, Multi30k)
``plot``               00       loss curves and labelled heatmaps
``exercises``          00       checkers for the coding exercises at the end of every chapter
``rnn``                01       RNN and GRU cells from scratch, the unrolled GRU, a GRU language model
``train``              01       the training loop (fit) and its bookkeeping parts
``checkpoint``         01       the checkpoint file: model, optimizer, vocabularies, config; atomic, safe
``timing``             01       the one timing helper (device synchronised, interleaved medians)
``seq2seq``            02       the encoder-decoder interface, a GRU encoder-decoder, the padded loss
``decoding``           02       greedy decoding, translating texts, evaluating a translator
``metrics``            02       corpus BLEU (sacreBLEU) and BLEU by source length
``rnn_attention``      03       Bahdanau and Luong attention, RNNsearch, the self-attentive embedding
``attention``          05       scaled dot-product attention (explicit and fast), masks, multi-head attention
``positional``         06       sinusoidal, learned and rotary position encodings
``relative_position``  06       Shaw et al.'s relation-aware attention, ALiBi
``transformer``        07       LayerNorm, feed-forward, encoder and decoder layers, the Transformer model
``lm``                 09       the decoder-only language model, generation with or without the cache
``sampling``           09       greedy, temperature, top-k and top-p sampling
``kv_cache``           09       the key-value cache (per layer and per stack; steps fork, never mutate)
``flash``              10       the online softmax and FlashAttention's tiling in plain PyTorch
``precision``          10       mixed precision: bf16/fp16 autocast, the gradient scaler
``training_step``      10       one optimiser step: precision, token-weighted accumulation, DDP, clipping
``rng``                10       the random number generators' states, captured and restored
``resume``             10       training states that resume a killed run exactly
``packing``            10       sentences packed into fixed-length blocks (no padding)
``throughput``         10       model FLOPs per token, device peaks, MFU, timed training steps
``compiling``          10       torch.compile with a fallback to eager mode
``speed``              10       fused AdamW where the device has it, a micro-batch sized to free memory
``profiling``          10       host reads counted, a torch.profiler table of a training step and its gaps
``distributed``        10       torchrun's environment, process groups, DDP helpers
``ddp_train``          10       the data-parallel training script (torchrun -m tfmlib.ddp_train)
``bpe``                11       byte-pair encoding: merges learned from word counts, subword pieces
=====================  =======  ==============================================================

Submodules are not imported here, so ``import tfmlib`` stays cheap and a notebook's imports say
exactly which chapters it builds on.
"""

__version__ = "0.1.0"
