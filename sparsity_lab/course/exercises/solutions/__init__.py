"""Worked solutions to the course exercises, one module per topic. Try the exercise first: the
``check_...`` functions say what is wrong without giving the answer away."""
