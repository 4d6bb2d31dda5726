"""Reserved token ids shared by every vocabulary, the model, decoding and the metrics."""

PAD, BOS, EOS = 0, 1, 2
