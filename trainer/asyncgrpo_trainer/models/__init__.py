"""Everything about model formats in one place: families, the network, weights in and out, tokenizers.

Backends (the torch policy and engines, Megatron, vLLM) take a `recipe.ModelBuild` from here and
never parse a checkpoint's config themselves.
"""
