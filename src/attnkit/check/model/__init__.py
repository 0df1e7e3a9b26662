"""``check_model`` (:mod:`.check`): every attention call of a transformers model judged
against the oracle. Its parts: loading models and inputs (:mod:`.load`), the wrappers
registered with transformers (:mod:`.session`), the two masks of a call (:mod:`.masks`),
judging a call (:mod:`.judge`), comparing implementations (:mod:`.compare`), the report
(:mod:`.report`), reproducers (:mod:`.repro`) and ``attnkit check model`` (:mod:`.command`).

Nothing is imported here: ``attnkit.check.model.check`` needs torch and transformers."""
