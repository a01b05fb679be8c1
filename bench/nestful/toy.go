package nestful

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// toySample is a sample in data_v2's layout: the rhombus question of
// NESTFUL's toy_data.jsonl, three chained calls with labels.
const toySample = `{"sample_id": "s1", "input": "The area of a rhombus is equal to the area of a rectangle whose length is 20cm and the breadth is 10cm. If one of the diagonals is 32cm what is the length of other diagonal?", "output": [{"name": "rectangle_area", "label": "$var_1", "arguments": {"arg_0": 20, "arg_1": 10}}, {"name": "multiply", "label": "$var_2", "arguments": {"arg_0": "$var_1.result$", "arg_1": 2}}, {"name": "divide", "label": "$var_3", "arguments": {"arg_0": "$var_2.result$", "arg_1": 32}}], "tools": [{"name": "rectangle_area", "description": "area of a rectangle", "parameters": {"arg_0": {"description": "length", "type": "int or float"}, "arg_1": {"description": "width", "type": "int or float"}}, "output_parameter": {"result": {"description": "the area", "type": "int or float"}}}, {"name": "multiply", "description": "multiplies two numbers", "parameters": {"arg_0": {"type": "int or float"}, "arg_1": {"type": "int or float"}}, "output_parameter": {"result": {"type": "int or float"}}}, {"name": "divide", "description": "divides two numbers", "parameters": {"arg_0": {"type": "int or float"}, "arg_1": {"type": "int or float"}}, "output_parameter": {"result": {"type": "int or float"}}}], "gold_answer": 12.5}`

// ToySample is a sample in NESTFUL's published layout (a rhombus question
// answered by three chained calls), for tests and demos of the loader,
// the scorer and the executor.
func ToySample() Sample {
	var s Sample
	if err := json.Unmarshal([]byte(toySample), &s); err != nil {
		panic(fmt.Sprintf("nestful: the toy sample does not parse: %v", err)) // a constant of this file
	}
	return s
}

// WriteToyFunctions writes an executable_functions folder in NESTFUL's
// layout into dir: basic_functions.py with the toy sample's functions,
// other files named by func_file_map.json (divide is in both, with other
// parameter names: the scorer takes basic_functions.py's first), a
// function that never returns and one that reports its arguments' types.
func WriteToyFunctions(dir string) error {
	files := map[string]string{
		"basic_functions.py": "import math\ndef rectangle_area(arg_0, arg_1):\n    return arg_0 * arg_1\n" +
			"def multiply(arg_0, arg_1):\n    return arg_0 * arg_1\ndef divide(arg_0, arg_1):\n    return arg_0 / arg_1\n" +
			"def add(arg_0, arg_1):\n    print('adding', arg_0, arg_1)\n    return arg_0 + arg_1\n" +
			"def pair(a, b):\n    return (a, b)\n",
		"py_code_file_1.py":  "def divide(x):\n    return 'the wrong divide'\ndef stats(numbers):\n    return {'total': sum(numbers), 'count': len(numbers)}\n",
		"py_code_file_2.py":  "def spin(n):\n    while True:\n        n += 1\n",
		"py_code_file_3.py":  "def kinds(*xs):\n    return [type(x).__name__ for x in xs]\n",
		"func_file_map.json": `{"divide": "py_code_file_1.py", "stats": "py_code_file_1.py", "spin": "py_code_file_2.py", "kinds": "py_code_file_3.py"}`,
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			return err
		}
	}
	return nil
}
