"""What a model's text means: role tag parsing and the strict format reward (`tags`), the regexes that
constrain each role's output (`grammar`), and code, test-input and final-answer extraction (`code`).
Everything here takes hostile text and never raises on it."""
