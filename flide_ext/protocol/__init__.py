"""What requests and answers look like on the wire and in Python: token requests
(what ``/v1/score`` reduces to), SGLang's ``/v1/decisions`` and System One
requests rendered into prompt ids, and the errors that name a request's field."""
