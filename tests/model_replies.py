"""Replies a real model wrote, captured from its server: the Markdown, lists,
URLs and units that the speakable text (voice/speech/speakable.py) and the
voice surface are tested on."""

# Replies as SmolLM2-135M-Instruct (Q4_1) wrote them through llama.cpp's server
# (llama-cpp-python 0.3.36, temperature 0, max_tokens 220; the facts are the
# model's own). Prompts: an egg guide "with a heading and bullet points", the
# ISS's speed "in km/s and mph", three Python websites "with their URLs", a
# `for` loop "with a small code example".
REAL_REPLIES = [
    (
        "Boiling an egg is a simple yet effective method that requires minimal ingredients. Here's how to do it:\n"
        "\n"
        "**Step 1: Boil the Egg**\n"
        "To boil an egg, you need to heat it until it reaches its boiling point. This can be done by placing the egg in a kettle or using a double boiler. \n"
        "\n"
        "**Step 2: Heat the Egg**\n"
        "Once the egg is boiled, remove it from the heat and let it cool down slightly before serving.\n"
        "\n"
        "**Step 3: Add the Egg to the Boiling Water**\n"
        "To add your favorite flavor of eggs to the boiling water, you can use a spoon or a fork to mix the egg with the hot water until it reaches its perfect consistency.\n"
        "\n"
        "Boiled Eggs:\n"
        "1. Boil an egg in a kettle or double boiler for 2 minutes.\n"
        "2. Add the boiled egg to your favorite flavor of eggs and serve."
    ),
    (
        "1. The International Space Station travels at approximately 27,031,849 meters per second (approximately 56,000 miles per hour) in standard Earth gravity and 1,000,000,000 kilometers per hour (about 1.5 times the speed of a commercial jetliner).\n"
        "2. The International Space Station travels at approximately 384,479 meters per second (approximately 62,000 miles per hour) in standard Earth gravity and 1,000,000 kilometers per hour.\n"
        "3. To convert to mph: 1 km/s * 5.67 = 7.98 seconds ≈ 4.2 hours (approximately 1.5 times the speed of a commercial jetliner).\n"
        "4. To convert to km/s, multiply by 2: 27,031,849 meters per second / 2 * 62,000 kilometers per hour = approximately "
    ),
    (
        "1. [Python](https://www.python.org/downloads/)\n"
        "2. [Django (Laravel)](http://djangodb.com)\n"
        "3. [Codecademy](https://codecademy.com)"
    ),
    (
        "A `for` loop in Python is a control flow statement that allows you to execute a block of code (the outer curly bracket) for each item in an iterable, such as a list or tuple.\n"
        "\n"
        "Here's a simple example:\n"
        "```python\n"
        "# Example of a for loop with a list comprehension\n"
        "numbers = [1, 2, 3, 4, 5]\n"
        "for num in numbers:\n"
        "    print(num)\n"
        "print(\"Loop executed\")\n"
        "```\n"
        "This will output: `Loop executed`\n"
        "\n"
        "In this example, the outer curly bracket is used to define an iterable (`list comprehension`) that takes each item of the input list as a parameter. The inner curly brackets are used to create a loop variable (the `num` in the original code) and then use it to iterate over the items of the list.\n"
        "\n"
        "The output will be: `Loop executed`"
    ),
]
