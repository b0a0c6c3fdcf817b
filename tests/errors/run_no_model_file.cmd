nosuch_model --tp 2
