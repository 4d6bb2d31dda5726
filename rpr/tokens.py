"""Reserved token ids shared by every vocabulary, the model, decoding and the metrics."""

PAD, BOS, EOS = 0, 1, 2


def content(ids) -> list[int]:
  """The ids before the first EOS, without PAD and BOS: what a vocabulary turns back into text."""
  out = []
  for i in ids:
    i = int(i)
    if i == EOS:
      break
    if i not in (PAD, BOS):
      out.append(i)
  return out
