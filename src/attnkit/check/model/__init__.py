"""``check_model`` (:mod:`.check`): every attention call of a transformers model judged
against the oracle. Its parts: loading models and inputs (:mod:`.load`), the wrappers
registered with transformers (:mod:`.session`), the two masks of a call (:mod:`.masks`),
judging a call (:mod:`.judge`), comparing implementations (:mod:`.compare`), running the
model (:mod:`.steps`), what its own mask code builds (:mod:`.facts`), every attention layer
accounted for (:mod:`.accounting`), tiny models of ~50 architectures (:mod:`.zoo`), the report
(:mod:`.report`), reproducers (:mod:`.repro`) and ``attnkit check model`` (:mod:`.command`).

Any other PyTorch model (:mod:`.any_model`): its SDPA, ``flex_attention`` and
``nn.MultiheadAttention`` calls recorded (:mod:`.torch_calls`) and judged one by one
(:mod:`.any_judge`, :mod:`.any_mha`, :mod:`.any_flex`), with reproducers
(:mod:`.any_repro`), every attention module accounted for (:mod:`.accounting`), and what
the command line needs for it (:mod:`.any_command`).

Nothing is imported here: ``attnkit.check.model.check`` needs torch and transformers."""
