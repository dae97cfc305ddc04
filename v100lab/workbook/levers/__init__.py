"""One module per notebook: each holds that notebook's steps — functions that return tidy rows, predicted and
measured, for one lever — and its ``PARAMETERS`` (the scenario keys its parameters cell holds): ``overview`` 00,
``triangle`` 01, ``ceiling`` 02, ``baseline`` 03, ``quantization`` 04, ``offload`` 05, ``context`` 06,
``flash_attention`` 07, ``batch_size`` 08, ``threads`` 09, ``parallel`` 10, ``loading`` 11, ``final`` 12,
``spec_decode`` 13, ``build`` 14; ``course`` lists them in reading order.

What every notebook shares lives beside them under a name that says so: ``steps`` (the scenario resolved once:
what is studied, predicted, measured, and why not), ``by_hand`` (the by-hand cells' ``agree``), ``exercises``
(the Try-it answers, ``what_if``), ``text`` (numbers and differences in words), ``captions`` (the sentence under
each plot) and ``summaries`` (each notebook's closing paragraph). A notebook imports the modules it calls
(``threads.threads_sweep(sc)``, ``captions.caption_threads(sc, sweep)``), so every cell says where its function
lives; no module is named after a scenario key, which the import would shadow. Functions here never print (logging only); a measurement llama.cpp refuses is data, kept in
``frame.attrs["failures"]`` with llama.cpp's reason.
"""
