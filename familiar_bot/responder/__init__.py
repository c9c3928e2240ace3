"""The transport-free responder: what happens when someone says something to the familiar.

``flow.Responder`` is the responder itself (the per-message steps, and why it is one class);
``messages`` is what a transport hands it and the rule for answering; ``reply_text`` the reply
call's messages and the reply's pieces; ``notices`` what a channel is told instead of a reply;
``writes`` and ``spool`` the turn-log writes kept in order while the log cannot take them;
``inspection`` the ``/context`` report; ``opening`` the real responder of a familiar, wired.
"""
