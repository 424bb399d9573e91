"""The fidelity benchmark's parts: question sets (``questions``), Hugging Face
transformers forwards of each full prompt (``reference``), label distributions and
their TV distance to float32 (``metrics``), the table and plot (``report``), and
the precision swaps of the error-source diagnostic (``swaps``)."""
