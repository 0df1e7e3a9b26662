"""Adapters to the frameworks people run attention in; each one is an optional extra.

- :mod:`attnkit.integrations.transformers` (``pip install attnkit[transformers]``): attnkit
  as a transformers ``attn_implementation``, in one line::

      model = AutoModelForCausalLM.from_config(cfg, attn_implementation=register())

Nothing is imported here, so ``import attnkit.integrations`` never needs a framework.
"""
