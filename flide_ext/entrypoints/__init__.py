"""How users reach Flide: the ``flide`` command line, SGLang's plugin entry point
(``--decision-mode``) and ``sgl.decide`` in SGLang's frontend language."""
