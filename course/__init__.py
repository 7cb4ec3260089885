"""The course's own tooling, which learners do not study: the grader, the book's figures, the
benchmarks, shipping the trained model and the site checks. ``llmcore`` never imports it."""
