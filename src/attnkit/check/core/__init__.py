"""What every kind of check shares: the float64 oracle and the 2x rule (:mod:`.oracle`), the
cases (:mod:`.cases`), judging a function case by case with its "other readings"
(:mod:`.judge`), reproducers (:mod:`.repro`) and findings and reports (:mod:`.report`)."""
