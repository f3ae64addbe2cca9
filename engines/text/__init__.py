"""What a model's text means: role tag parsing and the strict format reward (`tags`), the regexes that
constrain each role's output (`grammar`), code and test-input extraction (`code`), and final answers:
the last `\\boxed{}`, the `<answer>` tag, "the answer is" (`answers`); what a math question's numbers and
arithmetic say against its program (`arithmetic`). Everything here takes hostile text and never raises on it."""
