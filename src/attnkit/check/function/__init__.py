"""``check_softmax``, ``check_masked_softmax``, ``check_attention`` (:mod:`.check`), and what
is found out about a function before its cases run (:mod:`.detect`)."""
