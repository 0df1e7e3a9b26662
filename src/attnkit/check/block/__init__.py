"""``check_block`` (:mod:`.check`): a pre-norm Transformer block judged by behaviour."""
