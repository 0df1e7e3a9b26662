"""``check_multi_head`` (:mod:`.check`) and its probes: calls and reproducers
(:mod:`.probe`), masks (:mod:`.masks`), positions (:mod:`.positions`), gradients, the
``state_dict``, dropout and half precision (:mod:`.gradients`)."""
