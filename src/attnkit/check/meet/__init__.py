"""Meeting the user's code where it is: loading a target (:mod:`.targets`), building a class,
config or factory (:mod:`.build`), reading a calling convention off a signature
(:mod:`.adapt`) and calling it the same way in the check and in the reproducer
(:mod:`.calls`)."""
