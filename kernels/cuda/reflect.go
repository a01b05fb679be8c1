package cuda

import "reflect"

type funcField struct {
	name string
	ptr  any // pointer to the func field
}

// reflectFuncs lists the func fields of *struct s.
func reflectFuncs(s any) []funcField {
	v := reflect.ValueOf(s).Elem()
	var out []funcField
	for i := 0; i < v.NumField(); i++ {
		if v.Field(i).Kind() == reflect.Func {
			out = append(out, funcField{v.Type().Field(i).Name, v.Field(i).Addr().Interface()})
		}
	}
	return out
}
